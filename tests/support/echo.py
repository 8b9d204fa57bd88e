"""The raw nats-py request/reply echo the benchmarks measure gpuledger against: a script for its own
process, ``python -c ECHO <server url> <subject> [asyncio|uvloop]`` (asyncio by default)."""

ECHO = """
import asyncio, sys, nats
async def main():
    nc = await nats.connect(sys.argv[1])
    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe(sys.argv[2], cb=echo)
    await asyncio.Event().wait()
if len(sys.argv) > 3 and sys.argv[3] == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""
