"""The worker pool: this machine's GPUs (``gpus``, ``envprobe``, ``machine``), one worker process
per GPU started once and fed work items over a pipe (``pool``, ``worker``, ``dispatch``,
``supervise``), and what a worker builds to tune on (``skeleton``: the model's tunable layers;
``lm_head``: the LM head stubbed out). The only part of fi-autotune that imports torch and FlashInfer."""
