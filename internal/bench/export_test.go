package bench

// SuperuserPool is superuserPool, for the package's external tests.
var SuperuserPool = superuserPool
