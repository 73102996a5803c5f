"""The version floor is tested: no workbook source names a torch API that torch 2.6 lacks.

The check is static and differential (helpers.course.floor): each torch name the workbook
uses must exist in the floor's manifest (helpers/course/floor/torch-2.6.json.gz, read from the
torch 2.6 wheel by ``python -m helpers.course.floor build-manifest WHEEL``) whenever the
installed torch has it. Nothing here installs a second torch.
"""

import tomllib
from pathlib import Path

import pytest

from helpers import compat
from helpers.course import floor
from helpers.course.floor.release import Release
from helpers.course.floor.sources import cell_python

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def release():
    return Release.load()


def test_the_manifest_is_the_floors_torch(release):
    assert release.version.startswith(compat.FLOOR + ".")
    # what the README promises from 2.6 on ...
    assert release.has("torch.distributed.fsdp", "fully_shard")
    assert release.has("torch.distributed.tensor", "DTensor")
    assert release.has("torch.distributed", "pipelining")
    assert release.has("torch.distributed", "all_gather_into_tensor")
    assert release.has("torch", "randn") and release.has(
        "torch", "bfloat16"
    )  # C names, from the stubs
    # ... and what came later
    assert not release.has("torch.distributed", "all_gather_single")
    assert not release.has("torch.backends.cudnn", "conv")
    assert "set_reduce_scatter_max_input_buffers" not in release.attributes


def test_the_readme_states_the_floor_that_is_tested():
    readme = (ROOT / "README.md").read_text()
    assert f"supports torch ≥ {compat.FLOOR}" in readme


def offences(*cells: str, where: str = "synthetic.py") -> list[str]:
    sources = [floor.Source(f"{where} cell {i}", text) for i, text in enumerate(cells)]
    return [o.name for o in floor.check(sources)]


def test_a_name_newer_than_the_floor_fails_directly_and_through_an_alias():
    assert offences("import torch\ntorch.distributed.all_gather_single(out, x)\n") == [
        "torch.distributed.all_gather_single"
    ]
    assert offences(
        "import torch.distributed as tdist\n", "tdist.reduce_scatter_single(out, x)\n"
    ) == ["torch.distributed.reduce_scatter_single"]  # the alias made in one cell, used in the next
    assert offences("from torch.distributed import all_gather_single\n") == [
        "torch.distributed.all_gather_single"
    ]
    assert offences(
        "import torch.distributed as d\nf = getattr(d, 'all_gather_single', None)\n"
    ) == ["torch.distributed.all_gather_single"]


def test_newer_attributes_on_objects_fail():
    assert offences("import torch\nprint(torch.backends.cudnn.conv.fp32_precision)\n") == [
        "torch.backends.cudnn.conv"
    ]
    assert offences("import torch\nprint(torch.backends.cuda.matmul.fp32_precision)\n") == [
        ".fp32_precision"
    ]
    assert offences(
        "import torch\n\ndef f(model):\n    model.set_reduce_scatter_max_input_buffers(2)\n"
    ) == [".set_reduce_scatter_max_input_buffers"]


def test_keywords_newer_than_the_floor_fail():
    ddp = "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    assert offences(ddp + "DDP(m, forward_sync_buffers=False)\n") == [
        "torch.nn.parallel.DistributedDataParallel(forward_sync_buffers=...)"
    ]
    assert offences(ddp + "DDP(m, broadcast_buffers=False, gradient_as_bucket_view=True)\n") == []
    assert (
        offences(ddp + "from helpers import compat\nDDP(m, **compat.ddp_buffer_sync(False))\n")
        == []
    )
    dcp = "import torch.distributed.checkpoint as dcp\n"
    assert offences(dcp + "dcp.save(s, checkpoint_id='x', no_dist=True)\n") == [
        "torch.distributed.checkpoint.save(no_dist=...)"
    ]
    # another function named load takes **kwargs (torch.hub.load): the keywords are those of
    # the load torch 2.6 defines where the installed torch does, not of every load
    assert offences(dcp + "dcp.load(s, checkpoint_id='x', no_dist=True)\n") == [
        "torch.distributed.checkpoint.load(no_dist=...)"
    ]


def test_compat_gives_the_keywords_this_torch_takes():
    assert compat.ddp_buffer_sync(False) == {"forward_sync_buffers": False}  # the pinned 2.14
    assert compat.checkpoint_save_options() == {"no_dist": True}  # no process group here
    assert compat.checkpoint_save_options(load=True) == {"no_dist": True}


def test_helpers_compat_and_a_stated_guard_pass():
    assert offences("from helpers import compat\ncompat.all_gather_single(out, x)\n") == []
    assert (
        offences(
            "from helpers.compat import reduce_scatter_single\nreduce_scatter_single(out, x)\n"
        )
        == []
    )
    assert (
        offences(
            "import torch\ntorch.distributed.all_gather_single(o, x)  # floor: ok (a test of 2.14)\n"
        )
        == []
    )
    assert offences(
        "import torch\ntorch.distributed.all_gather_single(o, x)  # floor: ok\n"
    )  # no reason: fails


def test_floor_names_the_workbooks_own_names_and_other_libraries_pass():
    assert (
        offences(
            "import torch\nimport torch.distributed as tdist\ntdist.all_gather_into_tensor(o, x)\n"
        )
        == []
    )
    own = "import torch\n\nclass M:\n    def set_reduce_scatter_max_input_buffers(self, n): ...\n\nM().set_reduce_scatter_max_input_buffers(1)\n"
    assert offences(own) == []
    assert offences("import torch\nimport numpy as np\nnp.all_gather_single(1)\n") == []


def test_program_cells_are_read_and_the_message_says_what_to_do():
    cell = (
        "%%program lab2_zero1\nimport torch.distributed as tdist\ntdist.all_gather_single(out, x)\n"
    )
    [python] = [cell_python(cell)]
    [o] = floor.check([floor.Source("labs/x.ipynb cell 3", python)])
    assert (o.where, o.line) == ("labs/x.ipynb cell 3", 3)
    assert "helpers.compat.all_gather_single" in str(
        o
    ) and "tdist.all_gather_single(out, x)" in str(o)


def test_the_workbook_runs_on_the_floors_torch():
    found = floor.check(floor.workbook_sources(ROOT))
    for o in found:
        print(o)
    assert not found, f"{len(found)} use(s) of torch newer than {compat.FLOOR} (printed above)"


def test_the_site_profiles_load_a_torch_at_or_above_the_floor():
    """Jean Zay's pinned module is at or above the floor, and every cluster profile's job stops,
    saying so, when the torch it loaded is older (Perlmutter's unversioned module, a learner's
    conda environment)."""
    from helpers.cluster.profiles import load_profile

    jz = load_profile("jean-zay")
    version = tomllib.loads((ROOT / "slurm/profiles/jean-zay.toml").read_text())["fields"][
        "pytorch_version"
    ]
    assert compat.at_floor(version["default"]), version
    assert (
        not compat.at_floor("2.5.1")
        and compat.at_floor("2.6.0+cu124")
        and compat.at_floor("2.10.0")
    )
    for name in ("engaging", "jean-zay", "perlmutter"):
        setup = load_profile(name).setup
        check = [
            i
            for i, line in enumerate(setup)
            if line.startswith("python -m helpers.compat || exit 1")
        ]
        loads = [
            i for i, line in enumerate(setup) if line.startswith(("module load", "source activate"))
        ]
        assert check and check[0] > max(loads), (
            f"{name}: no floor check after the PyTorch it loads: {setup}"
        )
    assert jz.setup[-1].startswith("python -m helpers.compat")
