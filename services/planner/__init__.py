"""Planner: analyses a reference program and writes the structured plan the Coder follows."""
