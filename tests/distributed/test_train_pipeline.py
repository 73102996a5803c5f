"""helpers/programs/train_pipeline.py: Llama 2 stages x data parallelism on gloo ranks train
as one process would; pp is the outer mesh dimension; bad layouts are refused."""

import pytest
import torch
import torch.nn.functional as F

from helpers import launch
from helpers.models import llama2
from helpers.parallel.pipeline.pipeline_llama import LlamaStage
from helpers.programs import train_pipeline as T
from helpers.programs.train_llama import synthetic_tokens

CFG = dict(model="tiny", n_layers=4, batch_size=8, seq_len=16, microbatches=2, steps=3)


def _serial(cfg: T.PipelineConfig) -> list[float]:
    args = T._model_args(cfg)
    model = LlamaStage(llama2.Transformer(args), 0, args.n_layers).init_weights(cfg.seed)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    losses = []
    for step in range(cfg.steps):
        rows = synthetic_tokens(args.vocab_size, cfg.batch_size, cfg.seq_len, step, cfg.seed)
        loss = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _train(d, cfg):
    torch.set_num_threads(1)
    return T.train(d, cfg)


@pytest.mark.parametrize("world,pp,schedule,chunks", [(4, 2, "1f1b", 1), (2, 2, "interleaved", 2)])
def test_pipeline_times_data_parallel_trains_as_one_process(world, pp, schedule, chunks):
    cfg = T.PipelineConfig(**CFG, pp=pp, schedule=schedule, chunks=chunks)
    out = launch.spawn(_train, world, args=(cfg,))
    ref = _serial(cfg)
    for o in out:  # mean over micro-batches and replicas = the full batch's loss
        assert o["losses"] == pytest.approx(ref, rel=1e-5), (o["losses"], ref)
    assert out[0]["dp"] * cfg.microbatches * out[0]["micro_batch"] == cfg.batch_size
    assert ref[-1] < ref[0]


def test_bad_layouts_say_what_to_change():
    with pytest.raises(ValueError, match="must be dp"):
        T._check(T.PipelineConfig(**{**CFG, "batch_size": 6}), 4, 4)
    with pytest.raises(ValueError, match="divide the 6 ranks"):
        T._check(T.PipelineConfig(**CFG, pp=4), 6, 4)
    with pytest.raises(ValueError, match="--chunks >= 2"):
        T._check(T.PipelineConfig(**CFG, schedule="interleaved"), 4, 4)
    with pytest.raises(ValueError, match="cannot fill"):
        T._check(T.PipelineConfig(**CFG, pp=4, schedule="interleaved", chunks=2), 4, 4)
