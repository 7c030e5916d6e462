"""RL kit for the Coder: datasets of atomic-skill examples, the reward, the rubric judge."""
