"""llm.c token files (the format `fsdp data prepare` writes): a 256-int32
header (magic, version, token count), then the tokens: magic 20240520
version 1 for uint16 tokens, magic 20240801 version 7 for uint32."""
import numpy as np

MAGIC, VERSION = 20240520, 1


def write(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (MAGIC, VERSION, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def read(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    kinds = {(MAGIC, VERSION): np.uint16, (20240801, 7): np.uint32}
    dtype = kinds.get(tuple(int(x) for x in header[:2]))
    assert dtype is not None, f"{path}: header {header[:2]} is not an llm.c token file's"
    return np.fromfile(path, dtype=dtype, offset=1024, count=int(header[2]))


def window(tokens, start, length):
    """LENGTH tokens from START, wrapping at the end of the stream."""
    return np.take(tokens, np.arange(start, start + length) % len(tokens))


def learnable_stream(count, vocab, seed=0):
    """Tokens with structure a model learns in a few steps: each token
    follows from the one before it through a fixed random table, with one
    position in eight drawn at random."""
    rng = np.random.default_rng(seed)
    table = rng.integers(0, vocab, size=vocab)
    out = np.empty(count, dtype=np.int64)
    out[0] = 0
    noise = rng.random(count) < 0.125
    draws = rng.integers(0, vocab, size=count)
    for i in range(1, count):
        out[i] = draws[i] if noise[i] else table[out[i - 1]]
    return out
