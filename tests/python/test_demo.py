"""The demo (python -m hintbackend.demo) as a user runs it: it trains TinyGPT against the reference and
returns 0 only when losses and parameters match. With --dfs its attention (causal, learned relative bias)
runs in a dfs region: the forward and backward graphs each get slice loops (the backward's sums the
bias gradient over the slices), and the training still matches."""

import pytest

from conftest import device
from hintbackend import demo


@pytest.mark.parametrize("slice_dims", ["", "0,1"])
def test_demo_with_a_dfs_region_matches_the_reference(tmp_path, capsys, slice_dims):
    args = ["--steps", "2", "--device", device(), "--dfs", "--dump-dir", str(tmp_path)]
    if slice_dims:
        args += ["--slice-dims", slice_dims]
    assert demo.main(args) == 0
    out = capsys.readouterr().out
    assert "OK: hintbackend matches the reference" in out, out
    slices = 16 if slice_dims else 4  # batch 4 x heads 4, or batch only (the bias reads h)
    for kind in ("forward", "backward"):
        assert any(line.strip().startswith(kind) and f"dfs with slices={slices} of extent {slices}" in line
                   for line in out.splitlines()), out
