"""A stand-in for grpo_core/engines/vllm_worker.py that speaks its JSON-lines protocol without
vLLM, for tests of what VLLMRolloutEngine asks of its worker and in which order: every
request's op is appended to the file named by $FAKE_VLLM_OPS; `generate` writes one row per
prompt and sample (one token, id 5)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    ops = Path(os.environ["FAKE_VLLM_OPS"])
    print(json.dumps({"ok": True, "op": "ready", "vllm": "fake", "seconds": 0.0}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        with ops.open("a") as log:
            log.write(op + "\n")
        if op == "generate":
            rows = [
                {"prompt_index": p, "sample_index": j, "token_ids": [5], "logprobs": [-0.5],
                 "finish_reason": "length"}
                for p in range(len(request["prompt_token_ids"]))
                for j in range(int(request["n"]))
            ]  # fmt: skip
            Path(request["output"]).write_text(json.dumps({"rows": rows}))
        print(json.dumps({"ok": True, "op": op, "seconds": 0.0}), flush=True)
        if op == "shutdown":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
