"""What a change to the CUDA templates (codegen/cuda/*.cuh) does to the machine code, without a GPU: builds
benchmarks/flex_kernel_lab.cu in several configurations at a git revision and in the working tree, and prints,
per kernel, the registers (the occupancy a refactor can cost) and the instructions whose counts differ.

    python benchmarks/kernel_sass_diff.py [--rev HEAD] [--configs id128,sc128,...] [--jobs 2]

A refactor that should not change the code (a helper extracted, a loop reshaped) shows no row; register
moves and new local-memory traffic (STL, LDL: spills) are what to look for. MOV and IMAD.MOV count as one
opcode (ptxas picks either); NOPs (padding) do not count. Configurations: Hopper (sm_90a) at D64/D128 with the identity, the soft cap and
the learned relative bias of benchmarks/lab_mods (proven line and run-time probe), float32 (the SIMT kernels),
bf16 D256 (the SIMT backward), and sm_80 (the mma.sync kernels). Needs nvcc, CUTLASS's headers
(HINTBACKEND_CUTLASS_INCLUDE or the nvidia-cutlass wheel) and cuobjdump with nvdisasm: the CUDA toolkit's, or
the wheels `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`, found in site-packages.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HOPPER = ["-gencode", "arch=compute_90a,code=sm_90a", "-DHB_SM90=1"]
AMPERE = ["-gencode", "arch=compute_80,code=sm_80"]
MODS = {name: f'-DHB_LAB_MODS="lab_mods/{name}.cuh"' for name in ("softcap", "relbias")}
CONFIGS = {
    "id128": HOPPER + ["-DHB_D=128"],
    "id64": HOPPER + ["-DHB_D=64"],
    "sc128": HOPPER + ["-DHB_D=128", MODS["softcap"]],
    "rb128": HOPPER + ["-DHB_D=128", MODS["relbias"]],
    "rbprobe128": HOPPER + ["-DHB_D=128", MODS["relbias"], "-DLAB_LINE_PROBE"],
    "f32_64": HOPPER + ["-DHB_D=64", "-DHB_F32=1"],
    "f32rb128": HOPPER + ["-DHB_D=128", "-DHB_F32=1", MODS["relbias"]],
    "bf256": HOPPER + ["-DHB_D=256"],
    "sm80sc128": AMPERE + ["-DHB_D=128", MODS["softcap"]],
    "sm80rb64": AMPERE + ["-DHB_D=64", MODS["relbias"]],
}
SAME = {"MOV": "MOV*", "IMAD.MOV.U32": "MOV*", "IMAD.MOV": "MOV*"}


def tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for site in sys.path:
        for path in glob.glob(os.path.join(site, "nvidia", "cu*", "bin", name)):
            return path
    sys.exit(f"kernel_sass_diff: {name} not found (the CUDA toolkit's, or pip install nvidia-cuda-{name})")


def cutlass_include() -> str:
    env = os.environ.get("HINTBACKEND_CUTLASS_INCLUDE")
    if env:
        return env
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from hintbackend.options import default_cutlass_include

    found = default_cutlass_include()
    if not found:
        sys.exit("kernel_sass_diff: no CUTLASS headers (set HINTBACKEND_CUTLASS_INCLUDE or install nvidia-cutlass)")
    return found


def build(root: str, name: str, out: str, include: str) -> tuple[str, dict]:
    """The configuration's cubin under `out`; (error text, {kernel: (registers, opcode counts)})."""
    cubin = os.path.join(out, name + ".cubin")
    cmd = ["nvcc", "-O3", "-std=c++17", "-prec-div=false", f"-I{include}", "-I.", *CONFIGS[name], "-cubin", "-o",
           cubin, "benchmarks/flex_kernel_lab.cu"]
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        return "\n".join(line for line in r.stderr.splitlines() if "error" in line)[:2000], {}
    env = dict(os.environ, PATH=os.path.dirname(tool("nvdisasm")) + os.pathsep + os.environ.get("PATH", ""))
    sass = subprocess.run([tool("cuobjdump"), "-sass", cubin], capture_output=True, text=True, env=env).stdout
    res = subprocess.run([tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True, env=env).stdout
    regs = dict(re.findall(r"Function (\S+):\s*\n\s*REG:(\d+)", res))
    kernels: dict = {}
    current = None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = m.group(1)
            kernels[current] = (int(regs.get(current, -1)), collections.Counter())
            continue
        m = re.match(r"\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if current and m and m.group(1) != "NOP":  # (alignment padding)
            kernels[current][1][SAME.get(m.group(1), m.group(1))] += 1
    # The lab's own kernels (the float64 reference) live in an anonymous namespace whose name hashes the file.
    return "", {k: v for k, v in kernels.items() if k.startswith("_ZN3hbk")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rev", default="HEAD", help="the revision to compare the working tree with")
    p.add_argument("--configs", default=",".join(CONFIGS), help="which configurations")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args()
    repo = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    include = cutlass_include()
    names = args.configs.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        old_root = os.path.join(tmp, "rev")
        os.makedirs(old_root)
        archive = subprocess.run(["git", "archive", args.rev, "codegen", "benchmarks"], cwd=repo, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", old_root], input=archive, check=True)
        jobs = {}
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for side, root in (("rev", old_root), ("tree", repo)):
                out = os.path.join(tmp, side + "-out")
                os.makedirs(out, exist_ok=True)
                for name in names:
                    jobs[side, name] = pool.submit(build, root, name, out, include)
        print(f"{args.rev} -> working tree: kernels whose registers or instruction counts differ")
        same = True
        for name in names:
            (err_a, a), (err_b, b) = jobs["rev", name].result(), jobs["tree", name].result()
            for side, err in (("rev", err_a), ("tree", err_b)):
                if err:
                    print(f"{name}: the {side} build failed:\n{err}")
                    same = False
            for k in sorted(set(a) | set(b)):
                (ra, ca), (rb, cb) = a.get(k, (-1, collections.Counter())), b.get(k, (-1, collections.Counter()))
                if ra == rb and ca == cb:
                    continue
                same = False
                moved = {op: cb[op] - ca[op] for op in sorted(set(ca) | set(cb)) if ca[op] != cb[op]}
                print(f"{name:<11} {k[:60]:<60} regs {ra} -> {rb}, instructions {sum(ca.values())} -> "
                      f"{sum(cb.values())} {moved}")
        print("no difference" if same else "")


if __name__ == "__main__":
    main()
