# Build and publish the node agent image. The tag defaults to the version in pyproject.toml,
# which is the chart's appVersion, so `helm install` with default values pulls this image.
#   make image                      # build locally (docker buildx, current platform)
#   make image-push                 # build linux/amd64+arm64 and push to $(IMAGE)
#   make image-push IMAGE=registry.example.com/gpuslice TAG=0.1.0-rc1
IMAGE ?= ghcr.io/gpuslice/gpuslice
TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
PLATFORMS ?= linux/amd64,linux/arm64

.PHONY: image image-push check

image:
	docker buildx build --load -t $(IMAGE):$(TAG) .

image-push:
	docker buildx build --platform $(PLATFORMS) --push -t $(IMAGE):$(TAG) .

check:
	scripts/check
