"""Rule-based reward backend (rollart plugin ``rollart-reward-rule``)."""

from rollart_reward_rule.reward import RuleReward, RuleRewardOptions

__all__ = ["RuleReward", "RuleRewardOptions"]
