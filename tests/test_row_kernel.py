"""The row kernel (engine/core/kernels: rows.c built with this machine's compiler, called through ctypes): the same
products as F.linear within float32 rounding, each row's bits independent of the other rows, of the thread count
and of where its weight's rows lie; torch's own OpenMP team; and torch's path, with one warning, where it cannot be
built."""
from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import tiny_prompt  # noqa: E402
from engine.core import kernels, matvec  # noqa: E402
from engine.core.generate import GenerationRequest, generate  # noqa: E402
from engine.core.hooks import CAPTURE_OFF  # noqa: E402
from engine.serving.batch import BatchRunner  # noqa: E402
from test_lean import run_runner, same_tokens  # noqa: E402


@pytest.fixture
def kernel():
    """The kernel as this process built it (the suite runs where gcc builds it: CI's Debian, this machine)."""
    kernels.forget()
    built = kernels.row_kernel()
    assert built is not None, kernels.why_off()
    yield built


@pytest.fixture
def without_compiler(tmp_path, monkeypatch):
    """No compiler to be found and nothing built yet: a fresh cache folder and CC naming nothing. Every kernel
    forgotten after (the glue and attention kernels too: a lone step made meanwhile found them off, and a later
    test in the same process must find them built)."""
    monkeypatch.setenv("PLAYGROUND_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    kernels.forget_every()
    yield tmp_path
    kernels.forget_every()


def exact(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().T
    return y + b.double() if b is not None else y


SHAPES = [(1, 1), (3, 7), (65, 13), (130, 577), (1001, 64), (192, 576), (576, 1536), (67, 33)]   # (out, in)


@pytest.mark.parametrize("out,width", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_it_equals_the_float64_product_and_f_linear_for_one_to_eight_rows(kernel, out, width, bias):
    g = torch.Generator().manual_seed(out * 1000 + width)
    w = torch.randn(out, width, generator=g)
    b = torch.randn(out, generator=g) if bias else None
    for rows in range(1, kernels.MAX_ROWS + 1):
        x = torch.randn(rows, width, generator=g)
        got = kernel.linear(x, w, b)
        assert got.shape == (rows, out) and got.dtype == torch.float32
        scale = float(np.sqrt(width))                     # float32 rounding grows with the sum's length
        np.testing.assert_allclose(got, exact(x, w, b), atol=2e-6 * scale, rtol=1e-5)
        np.testing.assert_allclose(got, F.linear(x, w, b), atol=4e-6 * scale, rtol=2e-5)


@pytest.mark.parametrize("out,width", [(130, 577), (1001, 64), (960, 576), (67, 33)])
def test_a_rows_bits_are_the_same_alone_among_others_and_with_one_or_two_threads(kernel, out, width):
    """Each output's sum runs in one fixed order: row i of R rows equals row i alone, bitwise, for every R up to 8
    and 1 or 2 threads (the kernel's own count, and torch's through matvec.linear)."""
    g = torch.Generator().manual_seed(out)
    w, b = torch.randn(out, width, generator=g), torch.randn(out, generator=g)
    x = torch.randn(kernels.MAX_ROWS, width, generator=g)
    alone = torch.cat([kernel.linear(x[i:i + 1], w, b, threads=1) for i in range(len(x))])
    for rows in range(1, kernels.MAX_ROWS + 1):
        for threads in (1, 2, 3):
            assert torch.equal(kernel.linear(x[:rows], w, b, threads=threads), alone[:rows]), (rows, threads)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                assert torch.equal(matvec.linear(x[None, 3:6], w, b)[0], alone[3:6])
    finally:
        torch.set_num_threads(before)


TILED_ROWS = (1, 2, 3, 4, 5, 7, 8, 9, 13, 20, 33, 130)     # partial and full register tiles, several row blocks


@pytest.mark.parametrize("out,width", [(3, 32), (67, 33), (130, 577), (1001, 64), (960, 576), (576, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_tiled_and_panel_products_equal_the_float64_product_for_any_number_of_rows(kernel, out, width, bias):
    g = torch.Generator().manual_seed(out * 7 + width)
    w = torch.randn(out, width, generator=g)
    b = torch.randn(out, generator=g) if bias else None
    for rows in (1, 5, 33, 130):
        x = torch.randn(rows, width, generator=g)
        for got in (kernel.tiled(x, w, b), kernel.on_panels(x, kernel.pack(w), b)):
            assert got.shape == (rows, out) and got.dtype == torch.float32
            scale = float(np.sqrt(width))
            np.testing.assert_allclose(got, exact(x, w, b), atol=2e-6 * scale, rtol=1e-5)


def tiled_keeps_each_rows_bits(kernel: kernels.RowKernel, w: torch.Tensor, b: torch.Tensor | None,
                               x: torch.Tensor) -> bool:
    """Every row of every leading slice of x (TILED_ROWS rows), on 1, 2 and 3 threads, has the bits `linear` (the
    few-rows kernel) gives it alone on one thread: through `tiled` on the weight as stored, and through `on_panels`
    on its packed copy."""
    alone = torch.cat([kernel.linear(x[i:i + 1], w, b, threads=1) for i in range(len(x))])
    panels = kernel.pack(w)
    return all(torch.equal(kernel.tiled(x[:rows], w, b, threads=threads), alone[:rows])
               and torch.equal(kernel.on_panels(x[:rows], panels, b, threads=threads), alone[:rows])
               for rows in TILED_ROWS for threads in (1, 2, 3))


@pytest.mark.parametrize("out,width", [(67, 33), (130, 577), (960, 576), (576, 1536), (3, 1000), (5, 7), (4, 24)])
def test_the_tiled_product_gives_a_row_the_bits_it_gets_alone_among_any_rows_and_threads(kernel, out, width):
    """One fixed order per output whatever the rows, tiles and threads: row i of M rows through `tiled` equals row i
    alone through `linear` (the few-rows kernel a lone decode step takes), bitwise, for M from 1 to 130 (row tiles of
    4 full and partial, outputs tiles of 3 full and partial, more than one block of rows where the rows are wide)."""
    g = torch.Generator().manual_seed(out + width)
    w, b = torch.randn(out, width, generator=g), torch.randn(out, generator=g)
    x = torch.randn(max(TILED_ROWS), width, generator=g)
    assert tiled_keeps_each_rows_bits(kernel, w, b, x)


# Each register tile's multiply-add in rows.c (tiles_linear's and panels_linear's) and the row count of a full tile
MUTATED = [("acc[r][c][a] += xv * wv[c];", "TR"), ("acc[r][c] += xv * wv[c];", "PR")]


@pytest.mark.parametrize("fused,full", MUTATED, ids=["tiles", "panels"])
def test_a_product_whose_order_follows_the_row_count_fails_the_row_check(kernel, tmp_path, monkeypatch, fused, full):
    """The mutation: rows.c with each product rounded before it is added (no fused multiply-add) in full register
    tiles only, as a library's code path for full tiles might, in the tiles on the weights as stored or in the panels
    of a packed copy (a room's step, a prefill chunk); built and loaded as the kernel is, it gives a row other bits
    among 4 or more rows than alone, and the check above says so."""
    monkeypatch.setenv("PLAYGROUND_CACHE", str(tmp_path / "cache"))
    text = kernels.SOURCE.read_text()
    assert text.count(fused) == 1
    source = tmp_path / "rows.c"
    accumulator = fused.split(" += ")[0]
    source.write_text(text.replace(fused, f'{{ vec p = xv * wv[c]; if (rows == {full}) __asm__("" : "+v"(p)); '
                                          f'{accumulator} += p; }}'))
    mutant = kernels.RowKernel(kernels.build(source))
    g = torch.Generator().manual_seed(9)
    w, b, x = torch.randn(130, 577, generator=g), None, torch.randn(max(TILED_ROWS), 577, generator=g)
    assert tiled_keeps_each_rows_bits(kernel, w, b, x) and not tiled_keeps_each_rows_bits(mutant, w, b, x)


def test_a_panel_copy_takes_any_weight_shape(kernel):
    """Outputs not a multiple of a panel's, widths under one vector or past a span's end (zero rows and zero tails
    in the copy): each output equals the few-rows kernel's, bitwise, and a copy's floats cover whole panels."""
    g = torch.Generator().manual_seed(11)
    for out, width in ((1, 1), (2, 5), (7, 17), (64, 48)):
        w, b = torch.randn(out, width, generator=g), torch.randn(out, generator=g)
        panels = kernel.pack(w)
        assert (panels.out, panels.width) == (out, width) and panels.data.numel() >= out * width
        assert panels.data.numel() % 3 == 0                                          # whole panels of PN = 3 outputs
        x = torch.randn(9, width, generator=g)
        assert torch.equal(kernel.on_panels(x, panels, b)[:8], kernel.linear(x[:8], w, b))


# x86 targets rows.c must build for, whatever this machine is: its vector width is the widest the target has
# (SSE's 4 lanes, AVX2's 8, AVX-512's 16), and its register tile fits that target's registers. (-march, the CPU flag
# a machine needs to run the build)
TARGETS = [("x86-64", "sse2"), ("x86-64-v3", "avx2"), ("skylake-avx512", "avx512f")]


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86 targets")
@pytest.mark.parametrize("march,flag", TARGETS)
def test_it_builds_for_every_vector_width_and_keeps_each_rows_bits_where_it_runs(march, flag, tmp_path):
    """A change that builds only on this machine's CPU fails here (rows.c once held AVX-512 vectors in registers
    with an asm constraint that no AVX2 machine can meet: gcc refused it and the kernel was off there). Each build this
    CPU can run is loaded and checked as the kernel is: against float64, and each row's bits among other rows."""
    cc = kernels.compiler()
    made = tmp_path / f"rows-{march}.so"
    flags = [f"-march={march}" if f == "-march=native" else f for f in kernels.FLAGS]
    done = subprocess.run([cc, *flags, "-o", str(made), str(kernels.SOURCE)], capture_output=True, text=True,
                          timeout=kernels.BUILD_SECONDS)
    assert done.returncode == 0, done.stderr[-2000:]
    if flag not in kernels._cpu_flags().split():
        return                                                                  # built; this CPU cannot run it
    built = kernels.RowKernel(made)
    g = torch.Generator().manual_seed(len(march))
    w, b = torch.randn(130, 577, generator=g), torch.randn(130, generator=g)
    x = torch.randn(max(TILED_ROWS), 577, generator=g)
    np.testing.assert_allclose(built.tiled(x, w, b), exact(x, w, b), atol=2e-6 * 577 ** 0.5, rtol=1e-5)
    np.testing.assert_allclose(built.on_panels(x, built.pack(w), b), exact(x, w, b), atol=2e-6 * 577 ** 0.5, rtol=1e-5)
    assert tiled_keeps_each_rows_bits(built, w, b, x)


def test_fits_takes_any_number_of_rows_only_when_asked(kernel):
    w, many = torch.randn(30, 64), torch.randn(kernels.MAX_ROWS + 1, 64)
    assert not kernels.fits(many, w, None) and kernels.fits(many, w, None, max_rows=None)
    assert kernels.fits(many[:kernels.MAX_ROWS], w, None)


def test_weights_side_by_side_give_each_output_the_bits_it_gets_apart(kernel):
    """q|k|v as one matrix or one weight at a time: each output reads the same row of weights in the same order."""
    g = torch.Generator().manual_seed(3)
    parts = [torch.randn(n, 576, generator=g) for n in (576, 192, 192)]
    x = torch.randn(1, 576, generator=g)
    together = kernel.linear(x, torch.cat(parts))
    assert torch.equal(together, torch.cat([kernel.linear(x, p) for p in parts], -1))


def test_matvec_linear_takes_the_kernel_where_it_fits_and_torch_elsewhere(kernel):
    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(30, 64, generator=g), torch.randn(1, 1, 64, generator=g)
    assert torch.equal(matvec.linear(x, w), kernel.linear(x[0], w)[None])        # 30 outputs: no PARTS needed
    nine = torch.randn(kernels.MAX_ROWS + 1, 64, generator=g)                    # too many rows: F.linear
    assert torch.equal(matvec.linear(nine, w), F.linear(nine, w))
    transposed = torch.randn(64, 32, generator=g).t()                            # not (out, in) in memory
    assert not kernels.fits(x[0], transposed, None)
    assert torch.equal(matvec.linear(x, transposed), F.linear(x, transposed))
    for dtype in (torch.float64, torch.float16, torch.bfloat16):                 # another dtype: torch's product
        assert not kernels.fits(x[0].to(dtype), w.to(dtype), None)
        assert torch.equal(matvec.linear(x.to(dtype), w.to(dtype)), F.linear(x.to(dtype), w.to(dtype)))
    grad = w.clone().requires_grad_()
    assert not kernels.fits(x[0], grad, None)                                    # autograd: torch's, which has a backward
    assert matvec.linear(x, grad).requires_grad


def test_it_runs_on_torchs_own_openmp_team(kernel):
    """One OpenMP runtime in the process (torch's libgomp), the kernel's regions as many threads as torch's count,
    and no thread started beside torch's team."""
    maps = Path("/proc/self/maps").read_text()
    assert len({line.split()[-1] for line in maps.splitlines() if "libgomp" in line}) == 1
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(4096, 576, generator=g), torch.randn(1, 576, generator=g)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert kernel.max_threads() == threads == torch.get_num_threads()
        torch.set_num_threads(2)
        torch.randn(1_000_000).sum()                                             # torch's team of two exists
        tasks = set(os.listdir("/proc/self/task"))      # a thread another test left may end meanwhile: only a
        for _ in range(5):                               # thread that appears counts against the kernel
            kernel.linear(x, w)
        assert set(os.listdir("/proc/self/task")) <= tasks
    finally:
        torch.set_num_threads(before)


def test_the_library_is_built_once_and_named_by_its_source_flags_compiler_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_CACHE", str(tmp_path))
    kernels.forget()
    try:
        path = kernels.build()
        assert path.parent == tmp_path / "kernels" and path.name.startswith("rows-") and path.suffix == ".so"
        made = path.stat().st_mtime_ns
        assert kernels.build() == path and path.stat().st_mtime_ns == made       # found, not built again
        assert [p.name for p in path.parent.iterdir()] == [path.name]            # no temporary file left behind
        assert kernels.row_kernel().path == path
    finally:
        kernels.forget()


def test_without_a_compiler_the_products_take_torchs_path_with_one_warning(without_compiler, caplog):
    g = torch.Generator().manual_seed(6)
    w, x = torch.randn(192, 576, generator=g), torch.randn(1, 1, 576, generator=g)
    with caplog.at_level(logging.WARNING, logger="engine.kernels"):
        assert kernels.row_kernel() is None
        first = matvec.linear(x, w)
        matvec.linear(x, w)
    warnings = [r for r in caplog.records if r.name == "engine.kernels"]
    assert len(warnings) == 1 and "no C compiler found" in warnings[0].getMessage()
    assert "no C compiler found" in kernels.why_off()
    assert torch.equal(first, matvec.split(x, w))                                # the split products, bitwise
    np.testing.assert_allclose(first, exact(x, w, None), atol=1e-4, rtol=1e-5)


def test_a_compiler_that_fails_is_one_warning_and_torchs_path(without_compiler, monkeypatch, caplog):
    broken = without_compiler / "broken-cc"
    broken.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo broken 1.0; exit 0; fi\n"
                      "echo \"rows.c: In function 'load':\" >&2\n"           # gcc's first line: where, not what
                      "echo 'rows.c: error: nothing compiles here' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", str(broken))
    with caplog.at_level(logging.WARNING, logger="engine.kernels"):
        assert kernels.row_kernel() is None
    assert "failed to build rows.c: rows.c: error: nothing compiles here" in kernels.why_off()
    assert not list((without_compiler / "cache" / "kernels").glob("*.so"))
    x, w = torch.randn(2, 40), torch.randn(12, 40)
    assert torch.equal(matvec.linear(x, w), matvec.split(x, w))


def test_turned_off_and_on_again_in_one_process(kernel):
    x, w = torch.randn(1, 64), torch.randn(32, 64)
    on = matvec.linear(x, w)
    kernels.use(False)
    try:
        assert kernels.row_kernel() is None and "turned off" in kernels.why_off()
        assert torch.equal(matvec.linear(x, w), matvec.split(x, w))
    finally:
        kernels.use(True)
    assert kernels.row_kernel() is kernel and torch.equal(matvec.linear(x, w), on)



def test_a_lone_request_gives_the_same_answer_with_the_kernel_and_without_a_compiler(tiny_lm, without_compiler,
                                                                                    monkeypatch):
    """A lone request's steps with the kernel (built into a fresh cache folder), then with no compiler to build it
    (torch's split products): both answers equal the request through transformers' modules (tests/test_lean.py's
    check)."""
    request = GenerationRequest(tiny_prompt(9, seed=11), max_new_tokens=16, chat=False)
    want = list(generate(tiny_lm, request))
    for compiler in (None, str(without_compiler / "no-such-cc")):
        if compiler is None:
            monkeypatch.delenv("CC")
        else:
            monkeypatch.setenv("CC", compiler)
        kernels.forget()
        runner = BatchRunner(tiny_lm, max_batch=8)
        assert (kernels.row_kernel() is None) == (compiler is not None)
        (records,) = run_runner(tiny_lm, [(request, CAPTURE_OFF)], [0], runner)
        same_tokens(records, want)


def test_a_lone_steps_every_product_the_vocabulary_projection_included_runs_through_the_kernel(tiny_lm, kernel,
                                                                                                 monkeypatch):
    """Each decode step of a lone request multiplies its one row by every layer's weights and by the LM head (the
    vocabulary projection, tied to the embedding in SmolLM2) through the row kernel, none through torch (in one C call
    with the layers where the plan makes the whole token: LonePlan.token); so does the prefill's LM head, on its last
    token alone."""
    calls = []
    real = kernels.RowKernel.linear
    monkeypatch.setattr(kernels.RowKernel, "linear",
                        lambda self, x, w, *a, **kw: calls.append((x.shape[0], w.data_ptr())) or real(self, x, w, *a,
                                                                                                       **kw))
    bind = kernels.RowKernel.one_row                 # a lone step's products, bound once (matvec.Bound): one row each

    def one_row(self, w, *a):
        call = bind(self, w, *a)
        return lambda x, y: calls.append((1, w.data_ptr())) or call(x, y)
    monkeypatch.setattr(kernels.RowKernel, "one_row", one_row)
    from engine.core.lone import LonePlan            # its layers' products: the kernel's rows_linear, called from C
    after, o = LonePlan.after, tiny_lm.model.model.layers[0].self_attn.o_proj.weight

    def planned(self, i, attn):
        assert self.state.product == kernel.address
        return (i == 0 and calls.append((1, o.data_ptr()))) or after(self, i, attn)
    monkeypatch.setattr(LonePlan, "after", planned)
    whole = LonePlan.layers_at_once                  # or every layer in one C call (keys in place in the pool)

    def at_once(self, *args):
        assert self.state.product == kernel.address
        return calls.append((1, o.data_ptr())) or whole(self, *args)
    monkeypatch.setattr(LonePlan, "layers_at_once", at_once)
    token = LonePlan.token                           # or the whole token in one C call, the head's product in it

    def in_one_call(self, *args):
        assert self.state.product == kernel.address and self.ends.head == tiny_lm.model.lm_head.weight.data_ptr()
        calls.extend([(1, o.data_ptr()), (1, self.ends.head)])
        return token(self, *args)
    monkeypatch.setattr(LonePlan, "token", in_one_call)
    request = GenerationRequest(tiny_prompt(9, seed=11), max_new_tokens=6, chat=False)
    run_runner(tiny_lm, [(request, CAPTURE_OFF)], [0], BatchRunner(tiny_lm, max_batch=8))
    head = tiny_lm.model.lm_head.weight
    heads = [rows for rows, ptr in calls if ptr == head.data_ptr()]
    steps = [rows for rows, ptr in calls if ptr == tiny_lm.model.model.layers[0].self_attn.o_proj.weight.data_ptr()]
    assert set(heads) == {1}, heads                              # the lone row's logits: one row, through the kernel
    assert len(heads) == len(steps) + 1 >= 5                     # every decode step the layers ran in, and the
                                                                 # prefill's last token (one row: SmallBatchKernels)
