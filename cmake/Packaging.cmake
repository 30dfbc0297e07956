# Packaging.cmake - what `cmake --install` puts beside the programs and the
# library (the daemon's unit, configuration, system user, manual pages and
# documents), and the Debian packages `cpack -G DEB` makes of it all:
#
#   kvcached         component daemon: kvcached, kvctl, kvbench, the systemd
#                    unit, /etc/kvcached/kvcached.conf (a conffile), the user
#                    and group kvcached (sysusers.d), manual pages, documents
#   libkvclient0     component lib: libkvclient.so.0 (the package is named
#                    after the soname, as Debian names shared libraries)
#   libkvclient-dev  component dev: kvclient.h, libkvclient.a, the .so link,
#                    kvclient.pc, the CMake package kvclient
#
# Every install() rule of the tree names one of these components (the
# Python wheel's component, python, is none of them and is not packaged).
# Packages are made for the prefix the tree was configured with: configure
# with -DCMAKE_INSTALL_PREFIX=/usr for Debian's paths (README, "Install").
# Included from the top CMakeLists.txt after every folder.

# --- where systemd looks ---------------------------------------------------------------
# Under prefix /usr, systemd's own directories (systemd.pc: on Debian 12
# /lib/systemd/system and /usr/lib/sysusers.d); under any other prefix,
# PREFIX/lib/systemd/system (systemd reads /usr/local/lib/systemd/system)
# and PREFIX/lib/sysusers.d, and the configuration in PREFIX/etc/kvcached,
# each named relative to the prefix, so that `cmake --install --prefix P`
# puts them under P too.
set(KV_SYSTEMD_UNITDIR "" CACHE PATH "Directory of the installed systemd unit (empty: chosen)")
set(KV_SYSUSERSDIR "" CACHE PATH "Directory of the installed sysusers.d file (empty: chosen)")
set(kv_unitdir "${KV_SYSTEMD_UNITDIR}")
set(kv_sysusersdir "${KV_SYSUSERSDIR}")
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  if(NOT kv_unitdir)
    pkg_get_variable(kv_unitdir systemd systemdsystemunitdir)
  endif()
  if(NOT kv_sysusersdir)
    pkg_get_variable(kv_sysusersdir systemd sysusersdir)
  endif()
  if(NOT kv_unitdir)
    set(kv_unitdir /lib/systemd/system)
  endif()
  if(NOT kv_sysusersdir)
    set(kv_sysusersdir /usr/lib/sysusers.d)
  endif()
else()
  if(NOT kv_unitdir)
    set(kv_unitdir lib/systemd/system)
  endif()
  if(NOT kv_sysusersdir)
    set(kv_sysusersdir lib/sysusers.d)
  endif()
endif()
set(KV_CONF_DIR ${CMAKE_INSTALL_FULL_SYSCONFDIR}/kvcached)
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(kv_confdest ${KV_CONF_DIR})
else()
  set(kv_confdest ${CMAKE_INSTALL_SYSCONFDIR}/kvcached)
endif()
set(KV_SYSUSERS_FILE ${kv_sysusersdir}/kvcached.conf)   # postinst applies it
message(STATUS "kvcached: install prefix ${CMAKE_INSTALL_PREFIX}, unit in ${kv_unitdir}, "
               "configuration in ${KV_CONF_DIR}")

# --- the systemd unit ----------------------------------------------------------------------
# deploy/systemd/kvcached.service is the one source: as it is, the unit of
# an install by hand (its comments), running /usr/local/bin/kvcached; the
# installed copy names this configure's directories instead, and the
# manual pages installed with it (`systemd-analyze verify` runs man on a
# man: link, so the source names none: tests/sh/deploy_check.sh). Each
# replacement must happen: a unit whose lines changed shape stops the
# configure rather than installing a unit that runs the wrong daemon.
file(READ ${CMAKE_SOURCE_DIR}/deploy/systemd/kvcached.service kv_unit)
set(kv_swaps
  "\nExecStart=/usr/local/bin/kvcached " "\nExecStart=${CMAKE_INSTALL_FULL_BINDIR}/kvcached "
  " --config /etc/kvcached/kvcached.conf " " --config ${KV_CONF_DIR}/kvcached.conf "
  "\nDocumentation=file:///usr/local/share/doc/kvcached/"
  "\nDocumentation=man:kvcached(8) man:kvcached.conf(5) file://${CMAKE_INSTALL_FULL_DOCDIR}/")
while(kv_swaps)
  list(POP_FRONT kv_swaps kv_from kv_to)
  string(FIND "${kv_unit}" "${kv_from}" kv_at)
  if(kv_at LESS 0)
    message(FATAL_ERROR "deploy/systemd/kvcached.service has no '${kv_from}' to replace")
  endif()
  string(REPLACE "${kv_from}" "${kv_to}" kv_unit "${kv_unit}")
endwhile()
file(CONFIGURE OUTPUT ${CMAKE_BINARY_DIR}/deploy/kvcached.service CONTENT "${kv_unit}" @ONLY)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
             ${CMAKE_SOURCE_DIR}/deploy/systemd/kvcached.service)
install(FILES ${CMAKE_BINARY_DIR}/deploy/kvcached.service DESTINATION ${kv_unitdir}
        COMPONENT daemon)
# The user and group kvcached of the unit's User= and Group=.
install(FILES ${CMAKE_SOURCE_DIR}/deploy/systemd/kvcached.sysusers DESTINATION ${kv_sysusersdir}
        RENAME kvcached.conf COMPONENT daemon)
# The default configuration (its socket_dir and g3.path are the unit's
# RuntimeDirectory and StateDirectory).
install(FILES ${CMAKE_SOURCE_DIR}/deploy/kvcached.conf DESTINATION ${kv_confdest}
        COMPONENT daemon)

# --- manual pages and documents -----------------------------------------------------------
# docs/man/NAME.SECTION, installed compressed (gzip -n: the same bytes on
# every build) into the section's directory.
set(KV_MAN_PAGES kvcached.8 kvcached.conf.5 kvctl.1 kvbench.1)
set(kv_man_out)
foreach(page ${KV_MAN_PAGES})
  string(REGEX REPLACE ".*\\.([0-9])$" "\\1" kv_section ${page})
  set(kv_gz ${CMAKE_BINARY_DIR}/man/${page}.gz)
  add_custom_command(OUTPUT ${kv_gz}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
    COMMAND ${CMAKE_COMMAND} -E copy ${CMAKE_SOURCE_DIR}/docs/man/${page} ${CMAKE_BINARY_DIR}/man/
    COMMAND gzip -9 -n -f ${CMAKE_BINARY_DIR}/man/${page}
    DEPENDS ${CMAKE_SOURCE_DIR}/docs/man/${page} VERBATIM)
  list(APPEND kv_man_out ${kv_gz})
  install(FILES ${kv_gz} DESTINATION ${CMAKE_INSTALL_MANDIR}/man${kv_section} COMPONENT daemon)
endforeach()
add_custom_target(kv_man_pages ALL DEPENDS ${kv_man_out})
# The documents an operator reads (kvcached(8), FILES), flat in one folder.
set(kv_docs README.md docs/DESIGN.md daemon/OPS.md tiers/G3.md tiers/G4.md tiers/EVICTION.md)
list(TRANSFORM kv_docs PREPEND ${CMAKE_SOURCE_DIR}/)
install(FILES ${kv_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT daemon)

# --- the Debian packages -------------------------------------------------------------------
set(KV_DEB_MAINTAINER "kvcached maintainers <maintainers@kvcached.invalid>" CACHE STRING
    "Maintainer field of the Debian packages (Name <address>)")
set(KV_DEB_RELEASE 1 CACHE STRING "Debian revision of the packages (VERSION-REVISION)")
# The maintainer scripts and the conffiles list, with this configure's paths.
foreach(f postinst prerm postrm conffiles)
  configure_file(${CMAKE_SOURCE_DIR}/deploy/debian/${f}.in ${CMAKE_BINARY_DIR}/deploy/debian/${f}
                 @ONLY)
endforeach()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvcached)
set(CPACK_PACKAGE_VENDOR kvcached)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_STRIP_FILES ON)   # debugging symbols are not shipped
set(CPACK_INSTALL_DEFAULT_DIRECTORY_PERMISSIONS
    OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL daemon lib dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)   # NAME_VERSION-REVISION_ARCH.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE ${KV_DEB_RELEASE})
set(CPACK_DEBIAN_PACKAGE_MAINTAINER ${KV_DEB_MAINTAINER})
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Dependencies on shared libraries: dpkg-shlibdeps, from the ELF files.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Between components: -dev needs the library of its own version.
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_COMPONENT_DEV_DEPENDS lib)

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME kvcached)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION net)
# adduser: postinst's way to the user where systemd-sysusers is missing.
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
    ${CMAKE_BINARY_DIR}/deploy/debian/conffiles ${CMAKE_BINARY_DIR}/deploy/debian/postinst
    ${CMAKE_BINARY_DIR}/deploy/debian/prerm ${CMAKE_BINARY_DIR}/deploy/debian/postrm)
set(CPACK_DEBIAN_DAEMON_DESCRIPTION
"tiered KV-cache daemon for transformer inference engines
kvcached keeps transformer KV-cache blocks in tiers (GPU memory, pinned
host memory, local SSD, optionally a Redis Cluster shared by a fleet) and
hands them to the inference engines on the same machine over a Unix
socket.

This package holds the daemon kvcached, its operator tool kvctl, the
benchmark kvbench, a systemd unit (not enabled at install), the default
configuration in /etc/kvcached and the system user kvcached.")

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libkvclient0)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIB_DESCRIPTION
"client library of kvcached, the tiered KV-cache daemon
libkvclient is what an inference engine links to store KV-cache blocks
in kvcached and load them back: sessions, blocking and non-blocking
calls, the shared host-memory mapping, and the canonical chained block
hash.

This package holds the shared library.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libkvclient-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libsodium-dev")
set(CPACK_DEBIAN_DEV_DESCRIPTION
"client library of kvcached, the tiered KV-cache daemon (development)
libkvclient is what an inference engine links to store KV-cache blocks
in kvcached and load them back.

This package holds the header kvclient.h, the static library, the
pkg-config file kvclient.pc and the CMake package kvclient
(find_package(kvclient), target kvclient::kvclient).")

if(KV_HAVE_CUDA AND NOT CUDAToolkit_LIBRARY_DIR MATCHES "^/usr/lib")
  message(STATUS "kvcached: the CUDA runtime in ${CUDAToolkit_LIBRARY_DIR} belongs to no Debian "
                 "package: for packages, configure with -DKV_CUDA=OFF or Debian's CUDA toolkit")
endif()
include(CPack)
