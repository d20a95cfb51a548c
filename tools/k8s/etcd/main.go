// Command etcd is the etcd server, built from the pinned go.etcd.io/etcd/server/v3
// module (the proxy does not serve etcd's root module, which only holds this call).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
