"""A real Docker engine, Docker Compose and the images of deploy/, for the compose tests.

Everything is installed by the project's own code, as root, from Debian's packages and Go modules,
and cached outside the checkout (``~/.cache/gpuledger``): ``python -m tests.support.engine``.
"""
