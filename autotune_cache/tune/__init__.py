"""The GPU side, the top floor of the library: the machine and its worker pool, the skeleton model and the LM-head
stub, one warm orchestrator (a single target or a fleet), careful races, verify. Only the worker
processes, ``skeleton``, ``verify``, ``race`` and ``diffmeasure`` import torch and flashinfer."""
