"""Dev tooling of falkirk, not in the wheel: demo, trials, chaos, harness, generator, bench."""
