"""The data path: Caffe Datum LMDBs and HDF5 on a shared filesystem, manifests, sharded readers."""
