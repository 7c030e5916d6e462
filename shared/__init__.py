"""The common library every StitchCUDA service shares: settings, errors, ports, loop policy."""
