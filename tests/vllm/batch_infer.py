"""A batch job as users write one: vLLM's offline ``LLM(...)``, its engine a child of this script.

    python batch_infer.py MODEL_DIR STATE_DIR

Once the engine is up, writes ``STATE_DIR/engine.pid`` (the pid of this script's
``VLLM::EngineCore`` child), then waits for ``STATE_DIR/go`` (at most ``WAIT_S``), generates with
the same engine, writes what it generated to ``STATE_DIR/done`` and exits 0. A job whose engine
was signalled meanwhile cannot generate: it exits non-zero. Run by
tests/vllm/test_reaper_spares_jobs.py; not a test module.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

WAIT_S = 900


def engine_children() -> list[int]:
    """This process's children that vLLM named ``VLLM::EngineCore`` (the kernel keeps 15 bytes)."""
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if fields[1] == me and comm.startswith("VLLM::EngineCor"):
            found.append(int(entry))
    return found


def main() -> int:
    from vllm import LLM, SamplingParams

    model, state = sys.argv[1], Path(sys.argv[2])
    llm = LLM(model=model, max_model_len=256)
    (engine,) = engine_children()
    (state / "engine.pid.tmp").write_text(f"{engine}\n")
    (state / "engine.pid.tmp").rename(state / "engine.pid")
    deadline = time.monotonic() + WAIT_S
    while not (state / "go").exists():
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.1)
    out = llm.generate(["The GPU is"], SamplingParams(max_tokens=4, temperature=0))
    (state / "done").write_text(f"{len(out[0].outputs[0].token_ids)} tokens: {out[0].outputs[0].text!r}\n")
    return 0


if __name__ == "__main__":  # vLLM starts its engine with multiprocessing's spawn: the guard is required
    sys.exit(main())
