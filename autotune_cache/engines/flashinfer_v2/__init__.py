"""engines.flashinfer_v2"""
