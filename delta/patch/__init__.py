"""Diff and apply: `diff` codes the changes between two states as one delta file (a codec's streams in the
`format`'s container); `apply` decodes one against the state it was made from, proves the result, and
writes it all or nothing (`decode` + `write_changes` split that into the slow part and the pause)."""
