"""hintbackend under torch.distributed on the CPU (gloo, 2 processes launched by torchrun): the demo's
TinyGPT trains under DDP and under FSDP2 (fully_shard per block) compiled with hintbackend, and its
losses and final parameters match eager's in the same processes (hintbackend.distributed_demo does the
training and the comparison). The attention is in a dfs hinted_context region, and every graph piece
hintbackend compiles (Dynamo's DDP optimizer splits the graph at bucket boundaries; FSDP2's hooks
break it per block) carries the region's hints on its attention."""

import os
import re
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

from conftest import device


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(device() == "cuda" or not dist.is_available() or not dist.is_gloo_available(),
                    reason="the CPU check needs gloo (the GPU run is benchmarks/distributed.sh)")
def test_ddp_and_fsdp2_match_eager_and_keep_hints():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "-m", "hintbackend.distributed_demo", "--device", "cpu", "--dfs",
           "--steps", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout
    assert r.returncode == 0, out[-4000:] + r.stderr[-4000:]
    for mode in ("ddp", "fsdp2"):
        assert f"[{mode}] OK: hintbackend matches eager" in out, out
        diffs = re.search(rf"\[{mode}\] max \|loss diff\| = (\S+); max \|parameter diff\| after 4 steps = (\S+)", out)
        assert diffs and float(diffs.group(1)) <= 1e-4 and float(diffs.group(2)) <= 1e-4, out
        hints = re.search(rf"\[{mode}\] hints: rank 0: (\d+) forward and (\d+) backward graphs compiled, (\d+) with "
                          rf"attention; (\d+) of (\d+) attention nodes carry the hints", out)
        assert hints, out
        forward, backward, with_attention, hinted, total = map(int, hints.groups())
        assert forward >= 1 and backward >= 1 and with_attention >= 2 and hinted == total >= 2, out
    # DDP's optimizer split the model (2.6 MB of parameters, 1 MB buckets) into several pieces.
    ddp = re.search(r"\[ddp\] hints: rank 0: (\d+) forward", out)
    assert int(ddp.group(1)) >= 2, out
