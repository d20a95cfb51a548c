"""What the controller keeps for Services over netclaim networks (docs/services.md)."""
