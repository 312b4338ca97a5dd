"""A validation sample of a `switchyard prep` corpus for the experiment runner
(docs/experiments/README.md, "Validation"). The code corpus's validation split is 6.7 M
tokens (5 minutes of evaluation per run on one core) and its documents come in an order
that puts one file type first, so neither the whole split nor its first batches suit 24
evaluations per experiment. make() writes DST: the same corpus (its train shards and
tokenizer linked, not copied) whose validation split is `blocks` blocks of `block` tokens
taken at evenly spaced offsets over the whole source split, in bit-reversed order of
position (the first 2^j blocks are spread evenly too, so a run's own validation on its
first few micro-batches also sees every part of the split). The index's documents are
the pieces of the source documents each block holds, with their labels, so index.json is
valid for the loader (contiguous documents, totals that add up).
"""
import bisect
import json
import os
import struct

from array import array

MAGIC = b"SYTOKENS"  # the shard header (docs/data.md, "Shard format")


def _read_shard(path):
    with open(path, "rb") as f:
        head, body = f.read(32), f.read()
    magic, version, width, n, _ = struct.unpack("<8sIIQQ", head)
    if magic != MAGIC or width != 2 or len(body) != 2 * n:
        raise ValueError("%s: not a u16 token shard of version 1" % path)
    a = array("H")
    a.frombytes(body)
    return a


def _write_shard(path, tokens):
    body = tokens.tobytes()
    h = 0xcbf29ce484222325
    for b in body:  # FNV-1a 64 of the token bytes
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<8sIIQQ", MAGIC, 1, 2, len(tokens), h) + body)
    os.replace(path + ".tmp", path)


def _bitrev(i, bits):
    return int(format(i, "0%db" % bits)[::-1], 2) if bits else 0


def sample_tokens(src, blocks=1024, block=1024):
    """The number of validation tokens make() would give for SRC (writing nothing), or None
    when the source split is not larger than the sample."""
    with open(os.path.join(src, "index.json")) as f:
        index = json.load(f)
    total = sum(s["tokens"] for s in index["shards"] if s["split"] == "val")
    return None if blocks & (blocks - 1) or total <= blocks * block else blocks * block


def make(src, dst, blocks=1024, block=1024):
    """Writes DST (once; an existing DST with the same source and sizes is kept, another is
    rebuilt, its links to the old source's train shards and tokenizer replaced). Returns
    the number of validation tokens, or None when the source split is not larger than the
    sample (then the source is used as it is)."""
    with open(os.path.join(src, "index.json")) as f:
        index = json.load(f)
    val_shards = [i for i, s in enumerate(index["shards"]) if s["split"] == "val"]
    total = sum(index["shards"][i]["tokens"] for i in val_shards)
    if blocks & (blocks - 1) or total <= blocks * block:
        return None
    stamp = {"source": os.path.abspath(src), "blocks": blocks, "block": block}
    stamp_path = os.path.join(dst, "sample.json")
    if os.path.isfile(stamp_path):
        with open(stamp_path) as f:
            if json.load(f) == stamp:
                return blocks * block
        os.remove(stamp_path)  # first: a rebuild cut short is not taken for the old sample
    # The source's validation stream (its val shards in index order) and documents on it.
    stream = array("H")
    docs, base = [], 0
    for i in val_shards:
        a = _read_shard(os.path.join(src, index["shards"][i]["name"]))
        stream.extend(a)
        docs += [(base + d["offset"], d) for d in index["documents"] if d["shard"] == i]
        base += len(a)
    if len(stream) != total:
        raise ValueError("%s: the val shards hold %d tokens, index.json says %d" % (src, len(stream), total))
    bits = blocks.bit_length() - 1
    starts = [(j * (total - block)) // (blocks - 1) for j in range(blocks)]
    order = [starts[_bitrev(i, bits)] for i in range(blocks)]
    os.makedirs(dst, exist_ok=True)
    out = array("H")
    new_docs, d = [], 0
    sorted_docs = sorted(docs, key=lambda x: x[0])
    offsets = [o for o, _ in sorted_docs]
    shard_id = len([s for s in index["shards"] if s["split"] == "train"])
    for s in order:
        out.extend(stream[s:s + block])
        pos = s
        k = bisect.bisect_right(offsets, pos) - 1
        while pos < s + block:
            o, doc = sorted_docs[k]
            end = min(o + doc["tokens"], s + block)
            new_docs.append({"split": "val", "shard": shard_id, "offset": len(out) - (s + block) + pos,
                             "tokens": end - pos, "label": doc["label"], "source": doc.get("source", "")})
            pos, k = end, k + 1
    _write_shard(os.path.join(dst, "val-00000.bin"), out)
    shards = [s for s in index["shards"] if s["split"] == "train"]
    names = [s["name"] for s in shards] + [index["tokenizer"]]
    for entry in os.scandir(dst):  # links into a previous source (another corpus's shards)
        if entry.is_symlink() and entry.name not in names:
            os.remove(entry.path)
    for name in names:
        link = os.path.join(dst, name)
        target = os.path.abspath(os.path.join(src, name))
        if not (os.path.islink(link) and os.readlink(link) == target):
            if os.path.lexists(link + ".tmp"):
                os.remove(link + ".tmp")
            os.symlink(target, link + ".tmp")
            os.replace(link + ".tmp", link)
    totals = {}
    for lab in index["labels"]:
        totals[lab] = {"train": index["totals"][lab]["train"], "val": {"documents": 0, "tokens": 0}}
    for nd in new_docs:
        totals[nd["label"]]["val"]["documents"] += 1
        totals[nd["label"]]["val"]["tokens"] += nd["tokens"]
    train_docs = [x for x in index["documents"] if x["split"] == "train"]
    new = dict(index, shards=shards + [{"name": "val-00000.bin", "split": "val", "tokens": len(out)}],
               totals=totals, documents=train_docs + new_docs)
    with open(os.path.join(dst, "index.json"), "w") as f:
        json.dump(new, f)
    with open(stamp_path, "w") as f:
        json.dump(stamp, f)
    return len(out)
