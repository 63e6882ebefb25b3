"""Why a test's numeric bounds hold on every x86-64 CPU: the reasons given to
``@pytest.mark.isa_independent(reason)`` (tests/test_kernel_markers.py reads them from here). A test
whose expectation depends on the CPU's kernels is marked ``kernels`` instead."""

FP32_BOUND = (
    "fp32 against fp32 (or an eager fp32 model), bounded relative to the tensor's scale (nRMSE, or max "
    "error over max |reference|) well above the fp32 noise measured here; an ISA changes only the order "
    "of float32 sums and the use of FMA, i.e. that noise by ULPs"
)
DEFECT_BOUND = (
    "the bound separates a real defect or fault (errors of 1e-2 and more) from fp32 rounding: no ISA's "
    "rounding comes near it"
)
SAME_DATA = (
    "the values bounded are recomputed here from the same stored tensors (float64 statistics, the same "
    "backend's own results): no kernel of another CPU enters"
)
FLOAT64_BOUND = "float64 throughout: bounds of 1e-12 and below against float64's 2.2e-16, whatever the summation order"
NOT_A_KERNEL_VALUE = (
    "the bound is on data prepared in Python or on counts, pixels, memory or times, not on a value a "
    "runtime's kernel computed"
)
EMULATES_ITSELF = (
    "runs its own process under the emulated EPYC-Rome (qemu-x86_64): the same expectation on every host, "
    "and it cannot run nested inside the emulated run"
)
EXACT_OPS = (
    "exact operators only (data movement, Max/Relu/Clip, comparisons, casts, integer shapes): every correct "
    "kernel on every CPU returns the same bits, so an exact equality holds on any x86-64 CPU"
)
SAME_RUNTIME = (
    "one runtime compared with itself on the same CPU (the model with an injected fault against the clean "
    "one): whatever kernels a CPU selects, both runs use them, so untouched values stay bit-identical and "
    "the fault's change stays non-zero"
)
ONE_STEP = (
    "the bound is one quantization step: another summation order, or a value rounded the other way at a "
    "tie, moves a quantized output by at most one step on any CPU"
)
