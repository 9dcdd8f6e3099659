"""Opening an uploaded ONNX model in a worker process with a memory and a time limit.

onnxruntime parses, checks and constant-folds a graph when it opens it; a file of a few
hundred bytes can declare a constant of hundreds of megabytes (``ConstantOfShape``
8192 x 8192), which took four seconds of the event loop and 256 MB when the check ran in
the server (issue 32). Here a child process opens it: its address space is limited
(``RLIMIT_AS``), the memory opening took is measured (peak RSS over what the process held
before), and it is killed past the time limit. The parent gets one JSON line: the inputs'
and outputs' shapes, or why the model was refused.

Run as ``python -m platform_api.ai.model_check <file> <memory MB>``.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
from typing import Any

HEADROOM_MB = 512  # address space beyond the limit: onnxruntime's threads and arenas


class ModelRefused(Exception):
    """The model could not be opened within the limits; ``str()`` says why."""


def _dims(arg: Any) -> list[Any]:
    return [d if isinstance(d, int) else None if d is None else str(d) for d in arg.shape]


def _describe(args: list[Any]) -> list[dict[str, Any]]:
    return [{"name": a.name, "type": str(a.type), "shape": _dims(a)} for a in args]


def _open(path: str, memory_mb: int) -> dict[str, Any]:
    import onnxruntime

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # kB -> MB
    with open(f"/proc/{os.getpid()}/statm") as statm:
        virtual_mb = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") // 2**20
    limit = (virtual_mb + memory_mb + HEADROOM_MB) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        session = onnxruntime.InferenceSession(path, options,
                                               providers=["CPUExecutionProvider"])
    except MemoryError:
        return {"error": f"opening the model needs more than {memory_mb} MB"}
    except Exception as exc:  # onnxruntime raises its own kinds (InvalidGraph, Fail, ...)
        text = str(exc)
        if "bad_alloc" in text or "Failed to allocate" in text:
            return {"error": f"opening the model needs more than {memory_mb} MB"}
        return {"error": f"Not a usable ONNX model: {text[:300]}"}
    used = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024 - before
    if used > memory_mb:
        return {"error": f"opening the model took {used} MB (its graph declares large "
                         f"constants); the limit is {memory_mb} MB"}
    return {"inputs": _describe(session.get_inputs()),
            "outputs": _describe(session.get_outputs())}


async def check_model(path: str, *, memory_mb: int, seconds: float) -> dict[str, Any]:
    """What the worker found (inputs, outputs); :class:`ModelRefused` otherwise."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "platform_api.ai.model_check", path, str(memory_mb),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        out, _ = await asyncio.wait_for(process.communicate(), seconds)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise ModelRefused(f"opening the model took longer than {seconds:g} s") from None
    try:
        found: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ModelRefused("opening the model failed (the checker stopped: memory)") \
            from None
    if "error" in found:
        raise ModelRefused(found["error"])
    return found


if __name__ == "__main__":
    print(json.dumps(_open(sys.argv[1], int(sys.argv[2]))), flush=True)
