"""helpers.launch.quiet: library noise dropped at its source, everything else kept."""

import logging
import subprocess
import sys

from helpers.launch import quiet

RENAME = "`torch.distributed.all_gather_into_tensor` is deprecated. Please use ..."


def _warnings_seen(env_value: str) -> str:
    code = (
        "import warnings\n"
        f"warnings.warn({RENAME!r}, FutureWarning)\n"
        "warnings.warn('`old_api` is deprecated', FutureWarning)\n"
        f"warnings.warn({RENAME!r}, UserWarning)\n"
    )
    env = {"PYTHONWARNINGS": env_value, "PATH": ""}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return done.stderr


def test_rank_environment_drops_only_the_renamed_collectives():
    value = quiet.rank_environment({})["PYTHONWARNINGS"]
    seen = _warnings_seen(value)
    assert "FutureWarning: `torch.distributed.all_gather_into_tensor`" not in seen
    assert "FutureWarning: `old_api` is deprecated" in seen  # other FutureWarnings stay
    assert "UserWarning: `torch.distributed.all_gather_into_tensor`" in seen  # by category too


def test_rank_environment_keeps_what_the_user_set():
    env = {"PYTHONWARNINGS": "default", "KINETO_LOG_LEVEL": "2"}
    out = quiet.rank_environment(env)
    assert "PYTHONWARNINGS" not in out and "KINETO_LOG_LEVEL" not in out


def test_kernel_filter_drops_the_no_gpu_record_and_keeps_others(caplog, monkeypatch):
    monkeypatch.setattr(quiet, "has_nvidia_gpu", lambda: False)
    logger = logging.getLogger("DeepSpeed")
    before = list(logger.filters)  # importing helpers.launch installed it already
    logger.filters[:] = [f for f in before if not isinstance(f, quiet._DropRecord)]
    try:
        quiet.quiet_kernel()
        quiet.quiet_kernel()  # twice: one filter
        assert sum(isinstance(f, quiet._DropRecord) for f in logger.filters) == 1
        with caplog.at_level(logging.INFO, logger="DeepSpeed"):
            logger.info("Setting accelerator to CPU. If you have GPU ...")
            logger.info("DeepSpeed info: version=...")
        assert [r.getMessage() for r in caplog.records] == ["DeepSpeed info: version=..."]
    finally:
        logger.filters[:] = before
