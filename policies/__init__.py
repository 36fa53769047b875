"""Pure decisions: inputs in, decision out, time as a parameter. No I/O, no clock, no database.

The simulator and the live service run exactly this code.
"""
