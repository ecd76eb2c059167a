"""The head-node replacement controller."""
