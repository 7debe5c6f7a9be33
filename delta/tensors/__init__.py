"""States of a model as `delta` sees them: bit-level views of tensors (`bits`), state hashes (`hashing`),
state files (`state`), and the seam between host and device tensors (`_device`). Every other layer builds
on these; they import none of it."""
