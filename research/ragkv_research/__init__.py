"""ragkv research: studies and the plug-ins no default uses (not part of the installed product)."""
