"""Pure decision logic: the six passes from a DecisionRequest to a plan, receipt and dependencies."""
