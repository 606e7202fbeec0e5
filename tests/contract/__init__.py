"""Contract tests against the real sglang (tests/contract/build_env.sh)."""
