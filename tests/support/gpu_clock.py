"""A stand-in for the few torch.cuda calls ``race.py`` times with, so its rounds and strata run on CPU:
a replay or an eager call advances one clock by the call's time, and events read it."""

from __future__ import annotations


class GpuClock:
    now = 0.0


class Event:
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = GpuClock.now

    def elapsed_time(self, end):
        return end.t - self.t


class Torch:
    """What ``race._timed_rounds`` and ``race._first_runs`` take as ``torch``."""

    class cuda:
        Event = Event

        @staticmethod
        def synchronize():
            pass


class Graph:
    def __init__(self, ms):
        self.ms = ms

    def replay(self):
        GpuClock.now += self.ms
