"""Which precision a CPU run computes in, chosen per machine, and the guard that keeps its weights in fp32.

bf16 on a CPU is a win only where the CPU computes it natively (x86 `avx512_bf16` or AMX, Arm's `bf16`); elsewhere
oneDNN emulates it and a bf16 matmul is several times slower than fp32 (a 2.0 GHz Xeon without `avx512_bf16`: 58
GFLOPS fp32 against 17 bf16 on SmolLM2's MLP shape, one thread). So the choice is measured, not guessed:

  * `cpu_matmul_speeds()` times one matmul of SmolLM2's MLP shape (1024 × 576 × 1536) in fp32 and in bf16 with the
    process's thread count, after a warm-up (about a second), and caches the figures per CPU model, its bf16 flags,
    the torch version and the thread count in `$GRAIL_CACHE/precision/`;
  * `choose_cpu_precision(model_name)` picks bf16 when bf16's matmul is at least `BF16_MIN_SPEEDUP` times fp32's, and
    fp32 otherwise; the embedded tiny model keeps fp32 on every CPU (at 1.7M parameters element-wise overhead, not
    matmuls, sets its step: bf16 measured ~1.7× slower there). It returns the choice and the sentence saying why,
    which `grail train`, `grail eval` and `grail compare` print.

What bf16 means on a CPU here (`grail.training.trainer`): mixed precision, never bf16 master weights. The policy's
master weights and AdamW's state stay fp32; the matmuls run in bf16 under autocast, with each separate probe and each
micro-batch's loss forward inside one autocast region, so every weight is cast to bf16 once per phase rather than at
every forward; generation computes from a bf16 cast of the weights held for the call (`grail.models.bf16_weights`,
the `cpu_bf16_generation` field). Training pure bf16 weights would lose the updates: an AdamW step moves a weight by
about the learning rate, and at 5e-6 that is below half of bf16's spacing (2^(e-8) for a weight in [2^(e-1), 2^e))
for any weight above about 2e-3 in size, most of a model's (`bf16_lost_update_share`). `check_cpu_master_weights`
refuses such a run before its first step.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

__all__ = ["BF16_MIN_SPEEDUP", "FP32_PROBES", "CpuMatmulSpeeds", "PrecisionChoice", "bf16_lost_update_share",
           "check_cpu_master_weights", "choose_cpu_precision", "cpu_bf16_flags", "cpu_matmul_speeds",
           "forced_bf16_warning"]

BF16_MIN_SPEEDUP = 1.5  # bf16 below this matmul speed-up is not worth the rounding: fp32 is chosen
MATMUL_SHAPE = (1024, 576, 1536)  # (M, K, N): SmolLM2-135M's MLP up-projection on 1024 tokens
NATIVE_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 AVX-512 BF16, x86 AMX, Arm's BF16 (/proc/cpuinfo)
# Methods whose weights do not hold in bf16 by the fidelity rule (docs/results/cpu-step.md: on SmolLM2's regime
# rollouts, median per-row Spearman against fp32 at least 0.9, at most 0.1% of advantages changing sign): under CPU
# bf16 their probe runs separately, in fp32, while the loss keeps bf16 (grail.training.trainer). OAR-G's importance (how
# far embedding noise moves the answer's distribution) fails it: median 0.48, worst row 0.21. GRAIL's saliency holds
# (median 0.997).
FP32_PROBES = frozenset({"oar_g"})
ENV = "GRAIL_CPU_PRECISION"  # auto (default) | fp32 | bf16: pins the choice without measuring (the test suite: fp32)
TINY_REASON = ("fp32: the embedded tiny model (1.7M parameters) is bound by element-wise work, not matmuls, and runs "
               "~1.7x slower in bf16 on CPU")


@dataclass(frozen=True)
class CpuMatmulSpeeds:
    """One matmul of `MATMUL_SHAPE` in each precision, GFLOP/s at `threads` threads, on `cpu`."""
    fp32_gflops: float
    bf16_gflops: float
    threads: int
    cpu: str
    flags: tuple[str, ...]  # the NATIVE_FLAGS the CPU reports
    torch: str

    @property
    def bf16_speedup(self) -> float:
        return self.bf16_gflops / self.fp32_gflops


@dataclass(frozen=True)
class PrecisionChoice:
    bf16: bool
    reason: str  # one sentence: what was chosen and why, with the measured figures
    speeds: CpuMatmulSpeeds | None = None  # None: not measured (the tiny model, a GPU)


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_model_name() -> str:
    match = re.search(r"^(model name|Model|Hardware)\s*:\s*(.+)$", _cpuinfo(), re.MULTILINE)
    return match.group(2).strip() if match else (platform.processor() or platform.machine())


def cpu_bf16_flags() -> tuple[str, ...]:
    """The native-bf16 flags this CPU reports (empty where it has none, or /proc/cpuinfo is not there)."""
    lines = re.findall(r"^(?:flags|Features)\s*:\s*(.+)$", _cpuinfo(), re.MULTILINE)
    words = set(lines[0].split()) if lines else set()
    return tuple(flag for flag in NATIVE_FLAGS if flag in words)


def matmul_gflops(dtype: torch.dtype, shape: tuple[int, int, int] = MATMUL_SHAPE, repeats: int = 5) -> float:
    """GFLOP/s of an (M, K) @ (K, N) matmul in `dtype` at the process's thread count: the best of `repeats` after two
    warm-up products (the best, not the median: the machine's own speed, not its neighbours')."""
    m, k, n = shape
    generator = torch.Generator().manual_seed(0)
    a_MK = torch.randn(m, k, generator=generator).to(dtype)
    b_KN = torch.randn(k, n, generator=generator).to(dtype)
    for _ in range(2):
        a_MK @ b_KN
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a_MK @ b_KN
        best = min(best, time.perf_counter() - start)
    return 2 * m * k * n / best / 1e9


def _cache_file(cache_dir: str | Path | None, cpu: str, flags: tuple[str, ...], threads: int) -> Path:
    from grail.models.pretrained import default_cache_dir

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = re.sub(r"[^A-Za-z0-9.]+", "-", f"{cpu}-{'+'.join(flags) or 'no-bf16-flags'}-torch{torch.__version__}-"
                 f"t{threads}").strip("-")
    return root / "precision" / f"{key}.json"


def cpu_matmul_speeds(cache_dir: str | Path | None = None) -> CpuMatmulSpeeds:
    """This CPU's fp32 and bf16 matmul speeds at the current thread count: read from the cache, else measured (about
    a second) and cached. A cache file that does not parse is measured again and overwritten."""
    cpu, flags, threads = cpu_model_name(), cpu_bf16_flags(), torch.get_num_threads()
    path = _cache_file(cache_dir, cpu, flags, threads)
    try:
        record = json.loads(path.read_text())
        return CpuMatmulSpeeds(**{**record, "flags": tuple(record["flags"])})
    except (OSError, ValueError, TypeError, KeyError):
        pass
    speeds = CpuMatmulSpeeds(fp32_gflops=matmul_gflops(torch.float32), bf16_gflops=matmul_gflops(torch.bfloat16),
                             threads=threads, cpu=cpu, flags=flags, torch=torch.__version__)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(speeds), indent=2) + "\n")
        tmp.replace(path)
    except OSError:  # a read-only cache only costs the next run the second again
        pass
    return speeds


def _describe(speeds: CpuMatmulSpeeds) -> str:
    flags = ", ".join(speeds.flags) if speeds.flags else "no native bf16 flag (avx512_bf16, amx_bf16, bf16)"
    return (f"bf16 matmuls measured {speeds.bf16_gflops:.0f} GFLOP/s against fp32's {speeds.fp32_gflops:.0f} "
            f"({speeds.bf16_speedup:.2f}x) at {speeds.threads} thread(s) on this CPU ({speeds.cpu}; {flags})")


def choose_cpu_precision(model_name: str, cache_dir: str | Path | None = None,
                         speeds: CpuMatmulSpeeds | None = None) -> PrecisionChoice:
    """bf16 mixed precision on this CPU iff its measured bf16 matmul is at least BF16_MIN_SPEEDUP× fp32's, for a real
    model; fp32 for the embedded tiny model. `$GRAIL_CPU_PRECISION` (fp32 or bf16) pins it instead. `speeds`:
    measured figures to use instead of the cache (tests)."""
    from grail.options.fields import TINY_MODEL

    if model_name == TINY_MODEL:
        return PrecisionChoice(False, TINY_REASON)
    pinned = os.environ.get(ENV, "auto").strip().lower()
    if pinned not in ("auto", "fp32", "bf16"):
        raise ValueError(f"{ENV}={pinned!r}: set it to auto (measure this CPU), fp32 or bf16.")
    if pinned != "auto":
        return PrecisionChoice(pinned == "bf16", f"{'bf16 mixed precision' if pinned == 'bf16' else 'fp32'}: "
                                                 f"{ENV}={pinned}")
    speeds = speeds or cpu_matmul_speeds(cache_dir)
    if speeds.bf16_speedup >= BF16_MIN_SPEEDUP:
        return PrecisionChoice(True, f"bf16 mixed precision (fp32 master weights): {_describe(speeds)}", speeds)
    return PrecisionChoice(False, f"fp32: {_describe(speeds)}, below the {BF16_MIN_SPEEDUP}x that bf16 needs here",
                           speeds)


def forced_bf16_warning(model_name: str, cache_dir: str | Path | None = None,
                        speeds: CpuMatmulSpeeds | None = None) -> str | None:
    """The warning for `--bf16 true` on a CPU where bf16 is not faster, naming the measured slowdown (the tiny model's
    known one for it); None where bf16 is faster, or where `$GRAIL_CPU_PRECISION` pins the choice (nothing measured)."""
    from grail.options.fields import TINY_MODEL

    if model_name == TINY_MODEL:
        return f"bf16=true on CPU for the tiny model: expect it slower; {TINY_REASON.removeprefix('fp32: ')}."
    choice = choose_cpu_precision(model_name, cache_dir, speeds)
    if choice.bf16 or choice.speeds is None:
        return None
    return (f"bf16=true on a CPU without native bf16 speed: {_describe(choice.speeds)}, so the run's matmuls will be "
            f"about {1 / choice.speeds.bf16_speedup:.1f}x slower than in fp32; leave bf16 unset (or false) for fp32.")


def bf16_lost_update_share(param: torch.Tensor, step: float) -> float:
    """The share of `param`'s elements that an update of size `step` leaves unchanged once stored in bf16: those with
    |w| ≥ 2^e/2 where step < 2^(e-9) (half of bf16's spacing 2^(e-8) at w = m·2^e, m in [0.5, 1)); zeros excluded."""
    w = param.detach().float().flatten()
    w = w[w != 0]
    if w.numel() == 0:
        return 0.0
    _, exponent = torch.frexp(w)
    half_spacing = torch.ldexp(torch.ones_like(w), exponent - 9)
    return float((half_spacing > step).float().mean())


def check_cpu_master_weights(model: torch.nn.Module, learning_rate: float) -> None:
    """Refuse CPU training of a policy whose trainable weights are bf16 or fp16: at this learning rate an AdamW step
    (about `learning_rate` per weight) is below half the format's spacing for most weights, so most updates would
    vanish. The fix: load the policy in float32 and set bf16=true (autocast: fp32 master weights, bf16 matmuls)."""
    low = [p for p in model.parameters() if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)]
    if not low:
        return
    biggest = max(low, key=torch.Tensor.numel)
    lost = bf16_lost_update_share(biggest, learning_rate) if biggest.dtype == torch.bfloat16 else None
    share = f" (in its largest matrix, {lost:.0%} of the weights)" if lost is not None else ""
    raise ValueError(f"the policy's trainable weights are {biggest.dtype} on CPU: an AdamW step of about the learning "
                     f"rate {learning_rate:g} is below half of that format's spacing for most weights{share}, so "
                     f"those updates would round away. Load it in float32 (model_init_kwargs={{'dtype': "
                     f"'float32'}}) and set bf16=true: autocast computes the matmuls in bf16 and keeps fp32 master "
                     f"weights and optimizer state.")
