"""``bench/compare``: taskward beside its peers, interleaved in one run (see README.md).

Scripts, not a library: ``run.py`` is the driver and each ``system_*.py`` measures one system.
"""
