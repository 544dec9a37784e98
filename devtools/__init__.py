"""Developer tooling, not part of the runtime: the demo corpus generator, the dev server harness, UI screenshots."""
