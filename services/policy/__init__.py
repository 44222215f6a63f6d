"""policy: score-driven modes, guardrails, replace, circuit breaker and CEL rule sets (POL-*)."""
