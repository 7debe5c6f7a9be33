"""The rollout Space: inference engines that serve the latest published policy (``rollout_space.engines``)."""
