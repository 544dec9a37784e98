"""One package per pipeline stage; one module per step."""
