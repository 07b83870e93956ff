"""mnist_nn: a bagged ensemble of small conv nets, tuned by random search, trained at device speed."""
