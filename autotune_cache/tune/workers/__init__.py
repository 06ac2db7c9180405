"""The worker pool: this machine's GPUs (``gpus``, ``envprobe``, ``machine``), one worker process
per GPU started once and fed work items over a pipe (``pool``, ``worker``, ``dispatch``,
``supervise``), or served from workers that stay up between warms (``served``: where they are and
who may use them; ``serve``: a worker's session loop; ``attach``: its stand-in in the pool), and
what a worker builds to tune on (``skeleton``: the model's tunable layers; ``lm_head``: the LM head
stubbed out). ``worker``, ``skeleton`` and ``lm_head`` are the only modules of fi-autotune that
import torch and FlashInfer."""
