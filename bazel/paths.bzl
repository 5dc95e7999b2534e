"""path_copts: the binaries a test starts, as CMake's KVARENAD_PATH-style definitions.

CMake passes $<TARGET_FILE:kvarenad> (an absolute build path) as a compile definition;
here each is the binary's runfiles path ($(rootpath)), which is relative to the directory
a test runs in, and the binary goes into the test's data.
"""

def path_copts(paths):
    """{"KVARENAD_PATH": "//daemon:kvarenad"} -> ['-DKVARENAD_PATH="daemon/kvarenad"'].

    Use with data = paths.values() on the same target.
    """
    return ['-D%s=\\"$(rootpath %s)\\"' % (name, paths[name]) for name in sorted(paths)]
