"""The ``taskward`` command line: a thin click binding over the async public API.

Commands live in ``main``, rendering in ``output`` and the exception -> exit code table in
``errors``. The CLI never sees SQL or a dialect; it calls the library at the edge with
``asyncio.run`` (STYLE.md section 7).
"""
