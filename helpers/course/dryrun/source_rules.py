"""What a checked program may not ask itself: whether its device is CUDA.

On a GPU node ``d.device.type`` is ``"cuda"``; on the dry run's stand-in GPU it is ``"gpu"``
(``helpers.standin``). A program that compares its device with ``"cuda"`` itself (an
``if`` on the device's ``.type`` against that string, ``str(device).startswith("cuda")``,
``"cuda" in str(device)``)
takes the CPU's branch in the dry run, so what it does on a GPU is never run here, and the
check would pass a program it has not seen. ``cuda_comparisons`` finds such comparisons in a
program and in the modules beside it that it imports, so the check can refuse them, naming
the line and what to ask instead: ``helpers.devices`` answers for a GPU, real or stand-in.
"""

from __future__ import annotations

import ast
from pathlib import Path

__all__ = ["cuda_comparisons", "ADVICE"]

ADVICE = (
    "on the dry run's stand-in GPU the device type is 'gpu', so this takes the CPU's branch "
    "and what the program does on a GPU is never checked. Ask helpers.devices instead: "
    "devices.is_gpu(d.device) (a GPU, real or the stand-in), devices.pin_memory(d.device), "
    "devices.gpu_sized(d.device), devices.synchronize(d.device)"
)
_COMPARE = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def _is_cuda(node: ast.AST) -> bool:
    """'cuda', 'cuda:0', or a tuple/list/set holding one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value == "cuda" or node.value.startswith("cuda:")
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_cuda(e) for e in node.elts)
    return False


def _device_like(node: ast.AST) -> bool:
    """x.type, str(x) / repr(x) / f"{x}", or a name that says device (device, dev, d.device)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "type" or "dev" in node.attr.lower()
    if isinstance(node, ast.Name):
        return "dev" in node.id.lower()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in ("str", "repr", "format")
    return isinstance(node, ast.JoinedStr)


def _lines(tree: ast.AST) -> list[int]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, _COMPARE) for op in node.ops):
            sides = (node.left, *node.comparators)
            if any(_is_cuda(o) for o in sides) and any(_device_like(o) for o in sides):
                found.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
            and node.args
            and _is_cuda(node.args[0])
            and _device_like(node.func.value)
        ):
            found.append(node.lineno)
    return sorted(set(found))


def _local_imports(tree: ast.AST, folder: Path) -> list[Path]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return [folder / f"{n}.py" for n in sorted(names) if (folder / f"{n}.py").is_file()]


def cuda_comparisons(program: Path) -> list[str]:
    """'program.py:12: <the line>' for each comparison of a device with "cuda" in the
    program and the modules beside it that it imports."""
    program = Path(program)
    try:
        tree = ast.parse(program.read_text(), str(program))
    except (OSError, SyntaxError, ValueError):
        return []  # the run itself reports what cannot be read
    out = []
    for path in [program, *_local_imports(tree, program.parent)]:
        try:
            text = path.read_text()
            lines = _lines(tree if path == program else ast.parse(text, str(path)))
        except (OSError, SyntaxError, ValueError):
            continue
        source = text.splitlines()
        out += [f"{path.name}:{n}: {source[n - 1].strip()}" for n in lines]
    return out
