"""What is on disk, in the manner of huggingface_hub's cache manager: the layout ABC,
frozen records, the scan, selections, plan-then-execute deletion, crash-safe transactions,
archives and remote stores. Engine layouts subclass ``tree.layouts.base.CacheLayout``; the tree finds
them through ``autotune_cache.registry``, never by importing an engine."""
