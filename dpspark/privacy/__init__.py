"""The privacy core: public domain and clipping, contribution bounding, safe noise
mechanisms, the in-run accountant and the persistent ledger.

This package is the only place noise is drawn. It imports no algorithm family,
no CLI and no job.
"""
