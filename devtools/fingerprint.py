"""The serving environment every synthetic entry and stand-in GPU worker claims: an H200 with
FlashInfer 0.7.2.post1 (what ``_metadata`` of a rank file carries). Its own module, with nothing
to import: the stand-in worker (tests/standins/fake_worker.py) starts ~200 times a suite run and
needs this, not the entry writer behind ``devtools.synthetic``."""

DEFAULT_METADATA = {
    "flashinfer_version": "0.7.2.post1",
    "cuda_version": "13.0",
    "cublas_version": "13.1.0",
    "cudnn_version": "91500",
    "cudnn_frontend_version": "1.32.0",
    "cutlass_dsl_version": "nvidia-cutlass-dsl==4.8.1",
    "gpu": "NVIDIA H200",
}
