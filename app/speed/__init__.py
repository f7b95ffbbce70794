"""The speed and serving pages: the speed lab (lab_measured, lab_feel), cost, precision, batching, the room;
shared figures and hardware pickers.
"""
