"""engines.sglang"""
