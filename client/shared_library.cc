// libkvarena_client.so (cmake/install.cmake): the static kvarena_client linked whole into
// one shared library for workers built outside this tree. Its code is all in the archive;
// this file only gives the target a source.
