"""The store wing: entries moved out of and into a tree. Bundles and archives (``archive``:
verified tar.gz, staged then committed through a transaction), export files (``export``), and
remote stores through fsspec (``store``: records and bundles; ``storeio``: a deadline per
transfer; ``storerecord``: the record format; ``storehouse``: listing and deleting in a store;
``storesweep``: finishing killed deletes and sweeping orphan bundles; ``pull``). The store's
format is described in ``store.py``'s docstring and docs/cache-layout.md."""
