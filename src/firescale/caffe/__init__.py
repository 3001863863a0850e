"""Caffe's formats: the protobuf text reader, solver settings, learning-rate policies, Datum records."""
