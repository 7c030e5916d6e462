"""Version 1 of the StitchCUDA contracts."""
