"""The driver contract suite: one set of tests that every driver passes, memory as reference."""
