"""The serving layer: what runs on or against the deployed stack (smoke proofs, the wheelhouse and the tiny model
the roles push, `vllm bench serve` on the CPU build, and the hooks loaded into every serving process)."""
