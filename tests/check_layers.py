"""The SDK's include graph runs downward only (ctest: core.layers).

Layers, bottom up (a header may include its own layer and those below):
  0  config.hpp, types.hpp, error.hpp, diagnostics.hpp, properties.hpp
     (the capability schema), detail/ (helpers without policy)
  1  runtime.hpp and detail/contract.hpp (the contract, over the schema)
  2  device/   (Backend<R>: discovery, queries, visibility, report)
  3  stream/   (streams, events, the event pool)
  4  memory/   (the pools, over the streams' events)
  5  torch/    (the PyTorch adapters; the only headers that include torch)
accelkit.hpp includes everything below torch/; testing/ (the conformance
kit) sits above it and below torch/. Prints every arrow that runs
up or sideways, and fails if there is one.

Three headers of torch/ are the registration unit's, which includes no
PyTorch header (Note [Backend interface]: its compile time): register.hpp,
bound_backend.hpp and backend_interface.hpp, and whatever they include,
must not include one, even through another accelkit header."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "include"


def layer(rel):
    if rel == "accelkit/accelkit.hpp":
        return 4.5
    if rel.startswith("accelkit/testing/"):
        return 4.6
    if rel in ("accelkit/runtime.hpp", "accelkit/detail/contract.hpp"):
        return 1
    for prefix, level in (("accelkit/device/", 2), ("accelkit/stream/", 3),
                          ("accelkit/memory/", 4), ("accelkit/torch/", 5)):
        if rel.startswith(prefix):
            return level
    return 0


def main():
    wrong = []
    headers = sorted(p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.hpp"))
    for rel in headers:
        text = (ROOT / rel).read_text()
        for inc in re.findall(r"#include <(accelkit/[^>]+)>", text):
            if layer(inc) > layer(rel):
                wrong.append(f"{rel} (layer {layer(rel)}) includes {inc} (layer {layer(inc)})")
        if layer(rel) < 5 and re.search(r"#include <(torch|ATen|c10)/", text):
            wrong.append(f"{rel} includes a PyTorch header outside torch/")
    torch_free = ["accelkit/torch/register.hpp", "accelkit/torch/bound_backend.hpp",
                  "accelkit/torch/backend_interface.hpp"]
    seen, todo = set(), list(torch_free)
    while todo:
        rel = todo.pop()
        if rel in seen or not (ROOT / rel).exists():
            continue
        seen.add(rel)
        text = (ROOT / rel).read_text()
        if re.search(r"#include <(torch|ATen|c10)/", text):
            wrong.append(f"{rel} includes a PyTorch header, and the registration unit "
                         f"includes it ({', '.join(torch_free)})")
        todo.extend(re.findall(r"#include <(accelkit/[^>]+)>", text))
    print(f"{len(headers)} headers")
    for w in wrong:
        print("upward:", w)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
